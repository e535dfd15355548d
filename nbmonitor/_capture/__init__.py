"""TRAINING THREAD: what nbmonitor runs inside the user's loop (torch allowed).

See README.md beside this file."""
