"""A real ``dprc serve`` as a subprocess on a free port (the client, docs and log tests run
against one): started, waited for until ``/healthz`` answers, and stopped with its process
group. The helpers are the benchmarks' (``benchmarks.kit``), shared with them."""

from __future__ import annotations

from benchmarks.kit.memory import proc_memory
from benchmarks.kit.server import dprc_serve, server_pid

__all__ = ["dprc_serve", "proc_memory", "server_pid"]
