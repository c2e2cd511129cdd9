"""Tests of rules/usage."""
