"""What a rank of a parallel job needs before it meets the others, read and checked before any rendezvous: its
place (torchrun's variables), where the job's store is and who hosts it, the job's secret, the network interface
its sockets listen on, and how long a rank may show no sign of life.

Why checked first: a mistaken environment (``RANK=7 WORLD_SIZE=2``, nobody at ``MASTER_PORT``, a secret missing
on one rank) otherwise waits in a rendezvous until a timeout of minutes. Each problem is one line naming the
variable or flag.

Who hosts the store: the process that started the ranks (``LORABIND_JOB_STORE=launcher``: ``run --parallel``'s
launcher, or rank 0 of ``serve --parallel``, which supervises its ranks), torchrun's agent
(``TORCHELASTIC_USE_AGENT_STORE``), or else rank 0 itself, on ``MASTER_PORT`` (ranks started by hand or by a test).
"""

from __future__ import annotations

import ipaddress
import math
import os
import socket
import stat
import struct
from dataclasses import dataclass

import torch

from ...loaders.distributed.context_parallel import ring_device_refusal
from ...loaders.distributed.process_group import ParallelRunError, rank_from_environment
from ...loaders.placement.devices import resolve_device, session_defaults

SECRET_VARIABLE = "LORABIND_JOB_SECRET"
SECRET_FILE_VARIABLE = "LORABIND_JOB_SECRET_FILE"
INTERFACE_VARIABLE = "LORABIND_PARALLEL_INTERFACE"
STORE_VARIABLE = "LORABIND_JOB_STORE"
RANK_TIMEOUT_VARIABLE = "LORABIND_RANK_TIMEOUT_S"
RENDEZVOUS_VARIABLE = "LORABIND_RENDEZVOUS_TIMEOUT_S"
LAUNCHER = "launcher"
DEFAULT_RENDEZVOUS_S = 5.0  # reaching the store: it is up before any rank starts, unless ranks are started by hand
MEET_TIMEOUT_S = 60.0  # every rank arrived at the store (imports and start-up differ between processes)
DEFAULT_RANK_TIMEOUT_S = 60.0  # a rank without a heartbeat this long is stalled (a healthy one beats every 0.5 s)
MAX_TIMEOUT_S = 86400.0
MIN_SECRET_CHARS = 16
MAX_SECRET_BYTES = 4096
SECRET_HINT = (f"set {SECRET_VARIABLE} (at least {MIN_SECRET_CHARS} characters, the same on every rank), e.g. "
               f"export {SECRET_VARIABLE}=$(python -c 'import secrets; print(secrets.token_hex(32))'), or "
               f"{SECRET_FILE_VARIABLE} to a file only you can read (chmod 600)")
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


@dataclass(frozen=True)
class JobEnvironment:
    """One rank's view of its job; ``address`` is where its own sockets listen (the interface's address)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    store_host: str  # "launcher", "torchrun" or "rank 0"
    secret: bytes
    interface: str
    address: str

    @property
    def hosts_store(self) -> bool:
        return self.store_host == "rank 0" and self.rank == 0


def job_environment(interface: str | None = None) -> JobEnvironment | None:
    """This process's job, checked; None outside one. ``interface``: ``--parallel-interface``."""
    place = rank_from_environment()
    if place is None:
        return None
    rank, world, local_rank = place
    name, address = listen_interface(interface)
    master_addr, master_port = _master()
    store_host = (LAUNCHER if os.environ.get(STORE_VARIABLE) == LAUNCHER else
                  "torchrun" if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else "rank 0")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    hosted_here = store_host == "rank 0" and not _is_loopback_name(master_addr)
    if _is_loopback(address) and (world > local_world or hosted_here):
        raise ParallelRunError(f"MASTER_ADDR={master_addr} with WORLD_SIZE={world} and LOCAL_WORLD_SIZE="
                               f"{local_world}: a job across hosts names the network interface its ranks listen on "
                               f"with --parallel-interface NAME (or {INTERFACE_VARIABLE}); by default every socket "
                               "of a job listens on loopback only")
    return JobEnvironment(rank, world, local_rank, master_addr, master_port, store_host, job_secret(), name,
                          address)


def _master() -> tuple[str, int]:
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if not addr or len(addr) > 253 or not addr.isascii() or not addr.isprintable() or " " in addr:
        raise ParallelRunError(f"MASTER_ADDR={addr[:40]!r}: a rank needs the host of the job's store (torchrun "
                               "sets it; 127.0.0.1 on one machine)")
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):
        raise ParallelRunError(f"MASTER_PORT={port[:20]!r} is not a port number (ASCII digits, 1-65535)")
    return addr, int(port)


def job_secret() -> bytes:
    """The job's secret: ``LORABIND_JOB_SECRET``, or the content of ``LORABIND_JOB_SECRET_FILE`` (a regular file
    no other user can read). Taken out of the environment once read, so nothing this rank starts inherits it."""
    text = os.environ.pop(SECRET_VARIABLE, None)
    path = os.environ.get(SECRET_FILE_VARIABLE)
    if text is None and path:
        text = _read_secret_file(path)
    if text is None:
        raise ParallelRunError(f"this rank has no job secret: {SECRET_HINT}")
    if len(text.strip()) < MIN_SECRET_CHARS:
        raise ParallelRunError(f"the job secret is shorter than {MIN_SECRET_CHARS} characters: {SECRET_HINT}")
    return text.strip().encode()


def _read_secret_file(path: str) -> str:
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ParallelRunError(f"{SECRET_FILE_VARIABLE}={path}: {exc.strerror}") from None
    with os.fdopen(descriptor, "rb") as handle:
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise ParallelRunError(f"{SECRET_FILE_VARIABLE}={path} is not a regular file")
        if status.st_mode & 0o077:
            raise ParallelRunError(f"{SECRET_FILE_VARIABLE}={path} can be read by other users: chmod 600 it")
        data = handle.read(MAX_SECRET_BYTES + 1)
    if len(data) > MAX_SECRET_BYTES:
        raise ParallelRunError(f"{SECRET_FILE_VARIABLE}={path} is larger than a secret ({MAX_SECRET_BYTES} bytes)")
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise ParallelRunError(f"{SECRET_FILE_VARIABLE}={path}: a secret is ASCII text") from None


def listen_interface(name: str | None = None) -> tuple[str, str]:
    """(interface name, its IPv4 address) the job's sockets listen on: ``name`` (``--parallel-interface``), else
    ``LORABIND_PARALLEL_INTERFACE``, else the loopback interface."""
    name = name or os.environ.get(INTERFACE_VARIABLE)
    if not name:
        return loopback_interface(), "127.0.0.1"
    address = interface_address(name)
    if address is None:
        known = ", ".join(sorted(n for _, n in socket.if_nameindex()))
        raise ParallelRunError(f"--parallel-interface {name}: no network interface of this host by that name "
                               f"holds an IPv4 address (the interfaces: {known})")
    return name, address


def loopback_interface() -> str:
    """The name of the interface that holds 127.0.0.1 (``lo`` on Linux, ``lo0`` elsewhere)."""
    return interface_holding("127.0.0.1") or "lo"


def interface_holding(address: str) -> str | None:
    """The name of the interface whose IPv4 address is ``address`` (None when none is)."""
    return next((name for _, name in socket.if_nameindex() if interface_address(name) == address), None)


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface ``name`` (Linux's SIOCGIFADDR; None where that cannot be asked)."""
    try:
        import fcntl

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
    except (ImportError, OSError, UnicodeEncodeError):
        return None
    return socket.inet_ntoa(answer[20:24])


def bind_collectives_to(interface: str) -> None:
    """gloo and NCCL open their own listening sockets, on the host name's address unless told an interface:
    name ours for both, unless the user already chose one (their variables win)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _is_loopback_name(host: str) -> bool:
    if host == "localhost" or _is_loopback(host):
        return True
    try:
        return all(_is_loopback(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM))
    except OSError:
        return False


def seconds_setting(value, name: str, default: float) -> float:
    """A positive, finite number of seconds from a flag or variable (``default`` when unset)."""
    if value is None or value == "":
        return default
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise ParallelRunError(f"{name}={str(value)[:20]!r}: a number of seconds above 0 and at most "
                               f"{MAX_TIMEOUT_S:g}")
    return seconds


def rank_timeout(flag_value=None) -> float:
    """``--rank-timeout`` (or ``LORABIND_RANK_TIMEOUT_S``): how long a rank may show no sign of life."""
    if flag_value is not None:
        return seconds_setting(flag_value, "--rank-timeout", DEFAULT_RANK_TIMEOUT_S)
    return seconds_setting(os.environ.get(RANK_TIMEOUT_VARIABLE), RANK_TIMEOUT_VARIABLE, DEFAULT_RANK_TIMEOUT_S)


def rendezvous_timeout() -> float:
    return seconds_setting(os.environ.get(RENDEZVOUS_VARIABLE), RENDEZVOUS_VARIABLE, DEFAULT_RENDEZVOUS_S)


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def checked_job_request(spec, interface: str | None, rank_timeout_flag, *, starting_ranks: bool) -> float:
    """The job's flags checked before anything starts (``ParallelRunError`` naming the flag); returns the rank
    timeout. ``starting_ranks``: this process starts the ranks on this machine, which bounds them: one per GPU,
    or per core on the CPU (``ulysses=100000,cfg=2`` would start 200,000 processes)."""
    timeout = rank_timeout(rank_timeout_flag)
    listen_interface(interface)
    device = resolve_device(session_defaults()["device"])
    refused = ring_device_refusal(spec, device.type)
    if refused:
        raise ParallelRunError(refused)
    if starting_ranks:
        if device.type == "cuda":
            have, unit = torch.cuda.device_count(), "GPU"
        else:
            have, unit = usable_cores(), "CPU core"
        if spec.world_size > have:
            raise ParallelRunError(f"--parallel {spec.describe()} asks for {spec.world_size} ranks, one per {unit}, "
                                   f"but this machine has {have} {unit}{'s' if have != 1 else ''}: lower the "
                                   "degrees (torchrun across machines runs larger jobs)")
    return timeout
