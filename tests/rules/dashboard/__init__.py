"""Tests of rules/dashboard."""
