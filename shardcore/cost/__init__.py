"""What a layout costs on this machine: the measured profile (``shardcore calibrate``) the cost
model reads (:mod:`shardcore.cost.profile`)."""

from .profile import KINDS, calibrate, fit_line, load_profile, profile_path

__all__ = ["KINDS", "calibrate", "fit_line", "load_profile", "profile_path"]
