"""Making waste visible: usage rollups, the weekly report, the live dashboard and the `report` action."""
