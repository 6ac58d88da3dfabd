"""TileLang kernels (optional extra: pip install mindspeed-ops[tilelang])."""
