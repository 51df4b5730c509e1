"""Imported first, and only, by the local engine's fork server for its workers (see local.py):
the fork server then dies with the launcher, even by SIGKILL, and its workers with it, rather
than spending seconds unloading torch while they train on with no one to report to."""

from __future__ import annotations

from ember.engines.process import _die_with_parent

_die_with_parent()
