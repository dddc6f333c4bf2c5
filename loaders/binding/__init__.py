"""Binding: bring a shared model to a handle's exact patch state (fuse, restore, adapters)."""
