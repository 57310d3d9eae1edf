"""The CPUs this process may use: what sizes the busy poll (zvfs.fs.loop) and the decoder
processes (zvfs.decoders.pool), below both so that each can ask."""

from __future__ import annotations

import os


def usable_cpus(cgroups: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float:
    """The CPUs this process may use: those it may run on, or fewer if a cgroup's CPU quota
    (a systemd unit's CPUQuota=, a container's --cpus) allows less."""
    try:
        cpus: float = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroups, root)
    return cpus if quota is None else min(cpus, quota)


def cgroup_cpu_quota(cgroups: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """The smallest CPU quota (in CPUs) on the path of this process's cgroup, cgroup v2
    (``cpu.max``) or v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); None if none is set
    or none can be read."""
    try:
        with open(cgroups) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        if controllers == "":
            bases, v2 = [root, os.path.join(root, "unified")], True
        elif "cpu" in controllers.split(","):
            bases, v2 = [os.path.join(root, controllers), os.path.join(root, "cpu")], False
        else:
            continue
        for base in bases:
            for depth in range(len(parts), -1, -1):
                limit = _quota_in(os.path.join(base, *parts[:depth]), v2)
                if limit is not None:
                    limits.append(limit)
    return min(limits) if limits else None


def _quota_in(directory: str, v2: bool) -> float | None:
    try:
        if v2:
            with open(os.path.join(directory, "cpu.max")) as f:
                quota, period = f.read().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        with open(os.path.join(directory, "cpu.cfs_quota_us")) as f:
            quota_us = int(f.read())
        with open(os.path.join(directory, "cpu.cfs_period_us")) as f:
            period_us = int(f.read())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError, ZeroDivisionError):
        return None
