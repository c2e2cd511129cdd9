"""Tests of the node agent."""
