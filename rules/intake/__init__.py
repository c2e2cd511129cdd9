"""What both shells believe of an event before the core: decoded once per repeat, times on the server clock."""
