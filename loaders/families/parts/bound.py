"""``FamilyPart``: a part that answers by asking its family's other parts or facts."""

from __future__ import annotations


class FamilyPart:
    """A part bound to the one ``ModelFamily`` it belongs to (``family``, set when the family is made).

    Why a back reference: a part's answer often needs another part's (a Wan contract check asks the layout which
    expert plays which role, the denoise loop asks the layout for the roles and the family for its id), and the
    parts are made before the family that holds them."""

    family = None

    def bind(self, family) -> None:
        if self.family is not None and self.family is not family:
            raise ValueError(f"{type(self).__name__} already belongs to family {self.family.id!r}")
        self.family = family
