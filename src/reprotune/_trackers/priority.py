"""The priority of one thread of the MLflow worker (Linux: ``PRIO_PROCESS`` with a thread's id is
that thread alone): the thread that serves a run while the loop trains is lowered, then raised back
where that is allowed."""

from __future__ import annotations

import contextlib
import os
import sys

#: The nice value of the thread that serves the run while the loop trains.
TRAINING_NICE = 19


def set_nice(thread_id: int | None, nice: int) -> None:
    """Give one thread of this process the nice value ``nice`` where allowed (Linux, where
    ``PRIO_PROCESS`` with a thread's id is that thread alone).

    An observer must not slow what it observes: with the loop's intra-op threads on every core,
    MLflow's start-up and SQLAlchemy work at normal priority cost the quickstart's steps about
    10 %. So the thread that serves the run is lowered to :data:`TRAINING_NICE` once it has made
    the run (that start-up, which the end may wait on, at the worker's own priority), and the main
    thread, never lowered, does what is left once the loop is over. Not
    ``SCHED_IDLE``: there a thread got no CPU while other processes kept the cores busy, and the
    end of the run, waiting for it, was lost at the deadline; a nice thread keeps a small share
    (the fair scheduler starves none), and is raised back to the nice it started with at the
    loop's end where that is allowed (``CAP_SYS_NICE`` or ``RLIMIT_NICE``; lowering always is).
    """
    if thread_id is not None and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, thread_id, nice)


def nice_of(thread_id: int | None) -> int:
    """The nice value of a thread (None: the calling one), 0 where it cannot be read."""
    try:
        return os.getpriority(os.PRIO_PROCESS, thread_id or 0)
    except (OSError, AttributeError):
        return 0
