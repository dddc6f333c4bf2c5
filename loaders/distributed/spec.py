"""The ``--parallel`` spec: how many ranks split one model, and how.

``ulysses=2,cfg=2`` reads as a frozen record; the serving guide's flags (``--ulysses-degree``,
``--ring-degree``, ``--cfg-parallel-size``, ``--tensor-parallel-size``) fill the same record. Torch-free: the CLI
parses it before anything heavy is imported, so a typo is refused in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ..errors import LoraBindError

# our spelling -> the serving guide's flag of the same meaning
GUIDE_FLAGS = {
    "ulysses": "--ulysses-degree",
    "ring": "--ring-degree",
    "cfg": "--cfg-parallel-size",
    "tp": "--tensor-parallel-size",
}
CFG_BRANCHES = 2  # a guided step has two passes, conditional and unconditional: cfg can split over 2 ranks only


class ParallelSpecError(LoraBindError):
    """A ``--parallel`` value (or a guide flag) that cannot be read; the text names the flag and the bad part."""


@dataclass(frozen=True)
class ParallelSpec:
    """Degrees of each split; the ranks of one job are their product (every split multiplies the others)."""

    ulysses: int = 1
    ring: int = 1
    cfg: int = 1
    tp: int = 1

    @property
    def world_size(self) -> int:
        return self.ulysses * self.ring * self.cfg * self.tp

    @property
    def sequence(self) -> int:
        """Ranks that share one sequence (Ulysses x Ring): the context-parallel group's size."""
        return self.ulysses * self.ring

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    def describe(self) -> str:
        parts = [f"{field.name}={getattr(self, field.name)}" for field in fields(self) if getattr(self, field.name) > 1]
        return ",".join(parts) or "none"


def parse_parallel(text: str, flag: str = "--parallel") -> ParallelSpec:
    """``ulysses=2``, ``ring=2``, ``cfg=2``, ``tp=2`` or a comma-separated combination; each name once."""
    names = [field.name for field in fields(ParallelSpec)]
    degrees: dict[str, int] = {}
    for part in (p.strip() for p in str(text).split(",")):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in names:
            raise ParallelSpecError(f"{flag}: {part!r} is not NAME=N; the names are {', '.join(names)} "
                                    f"(e.g. {flag} ulysses=2,cfg=2)")
        if name in degrees:
            raise ParallelSpecError(f"{flag}: {name} is given twice")
        degrees[name] = _degree(value.strip(), f"{flag}: {name}")
    return _checked(ParallelSpec(**degrees), flag)


def with_guide_flag(spec: ParallelSpec, name: str, value, flag: str) -> ParallelSpec:
    """``spec`` with one guide flag's degree; the same degree given twice two ways must agree."""
    degree = _degree(str(value), flag)
    current = getattr(spec, name)
    if current != 1 and current != degree:
        raise ParallelSpecError(f"{flag} {degree} contradicts {name}={current} of --parallel")
    return _checked(replace(spec, **{name: degree}), flag)


def ulysses_heads_refusal(spec: ParallelSpec, heads: int, what: str) -> str | None:
    """Why ``spec``'s Ulysses degree cannot share ``what``'s ``heads`` attention heads (None: it can), from the
    denoiser's config, before anything loads. Ulysses gives each rank whole heads: with ring as well the degree
    must divide them; alone, diffusers' uneven mode pads the last rank's heads, which works while the padding is
    smaller than a rank's share (its own assertion, raised only at the first attention otherwise)."""
    degree = spec.ulysses
    padding, share = -heads % degree, -(-heads // degree)
    if degree == 1 or padding == 0 or (spec.ring == 1 and padding < share):
        return None
    divisors = [d for d in range(2, heads + 1) if heads % d == 0]
    fits = f"use a degree that divides {heads} ({', '.join(map(str, divisors))})" if divisors else "leave ulysses at 1"
    return (f"--parallel {spec.describe()}: ulysses={degree} cannot share the {heads} attention heads of {what} "
            f"(each rank runs whole heads); {fits}, or split it with ring= instead")


def _degree(value: str, what: str) -> int:
    """Python's ``int`` reads any script's digits (``int("٢") == 2``) and underscores (``1_0``); a degree is
    written in ASCII digits only, so what the user sees in a process list is what runs."""
    if not (value.isascii() and value.isdigit()):
        raise ParallelSpecError(f"{what}={value!r} is not a whole number (ASCII digits 0-9)")
    degree = int(value)
    if degree < 1:
        raise ParallelSpecError(f"{what}={degree}: a degree is 1 or more")
    return degree


def _checked(spec: ParallelSpec, flag: str) -> ParallelSpec:
    if spec.cfg not in (1, CFG_BRANCHES):
        raise ParallelSpecError(f"{flag}: cfg={spec.cfg}: classifier-free guidance has {CFG_BRANCHES} passes "
                                f"(conditional, unconditional), so cfg is 1 or {CFG_BRANCHES}")
    return spec
