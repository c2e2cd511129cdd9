"""Actions: one registry for built-ins and plugins, and the runner that executes requests safely."""
