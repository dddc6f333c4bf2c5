"""Dispatch: the family-independent verbs that ask the model's family (generation steps, contract discovery)."""
