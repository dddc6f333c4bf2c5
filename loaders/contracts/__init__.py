"""Contracts and schedules: what a file declares and how a request is checked against it."""
