"""A ``lorabind serve --parallel`` job started by hand, its ranks in spawned processes as torchrun would start them:
each rank runs the CLI's serve command with its savers wrapped to write every decoded tensor they are handed to
``captures/r<rank>/<n>.safetensors``, so outputs are compared as floats before any 8-bit encoding."""

from __future__ import annotations

import contextlib
import os
import time
import urllib.request
from pathlib import Path

import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from lorabind.runtime.cli import main
from lorabind.runtime.parallel.launch import free_port
from saver_capture import capturing_savers

JOB_SECRET = "the served job's secret for these tests"


def serve_rank(rank: int, world_size: int, master_port: int, captures: str, argv: list, lora_dirs: list) -> None:
    """One rank of the served job (a spawned process): the CLI's serve command, its savers' tensors written to
    ``captures/r<rank>/<n>.safetensors`` in the order they come."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1",
                      LORABIND_JOB_SECRET=JOB_SECRET,  # started by hand, as torchrun would: the user's secret
                      LORABIND_RENDEZVOUS_TIMEOUT_S="120")  # rank 0 starts the store as rank 1 reaches for it
    torch.set_num_threads(1)
    folder = Path(captures) / f"r{rank}"
    folder.mkdir(parents=True, exist_ok=True)

    def keep(key: str, tensor) -> None:
        save_file({"output": tensor.contiguous()}, str(folder / f"{len(list(folder.iterdir())):03d}.safetensors"))

    with capturing_savers(keep):
        main([*argv, "--allow-lora-dir", lora_dirs[rank]])


class ServedJob:
    def __init__(self, url: str, captures: Path, processes):
        self.url, self.captures, self.processes = url, captures, processes

    def captured(self, rank: int) -> list[torch.Tensor]:
        return [load_file(str(p))["output"] for p in sorted((self.captures / f"r{rank}").glob("*.safetensors"))]


def wait_until_up(url: str, processes, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert all(p.is_alive() for p in processes), "a rank of the served job exited"
        try:
            urllib.request.urlopen(url + "/system_stats", timeout=2).close()
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"serve --parallel did not answer within {timeout} s")


@contextlib.contextmanager
def served_job(port: int, argv: list, captures: Path, lora_dirs: list, world_size: int = 2):
    """The job of ``argv`` (a ``serve ... --parallel`` command line listening on ``port``), up; stopped after."""
    context = mp.start_processes(serve_rank, args=(world_size, free_port(), str(captures), argv, lora_dirs),
                                 nprocs=world_size, join=False, start_method="spawn")
    try:
        wait_until_up(f"http://127.0.0.1:{port}", context.processes)
        yield ServedJob(f"http://127.0.0.1:{port}", captures, context.processes)
    finally:
        for process in context.processes:
            process.terminate()
        for process in context.processes:
            process.join(30)
