"""Tests of rules/intake."""
