"""Tests of the rules engine core."""
