"""Usage over time: hourly rollups, their SQLite store, weekly reports and trends, and how they are rendered."""
