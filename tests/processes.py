"""The check behind every test's no-stray-children fixture."""

from __future__ import annotations

import os

import psutil


def kill_stray_children(keep: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """Kill this process's live descendants except `keep` (and multiprocessing's resource
    tracker); return the pids that were still there."""
    me = psutil.Process(os.getpid())
    stray = [
        p
        for p in me.children(recursive=True)
        if p.pid not in keep
        and p.is_running()
        and p.status() != psutil.STATUS_ZOMBIE
        and "resource_tracker" not in " ".join(command_line(p))
    ]
    for process in stray:
        process.kill()
    return [p.pid for p in stray]


def command_line(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []
