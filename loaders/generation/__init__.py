"""Generation: the family-independent sampling entry points and the shared maths."""
