"""Test support code shared by the test folders: the tiny model and the FastChat stack."""
