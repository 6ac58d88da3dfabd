from ...ops.gdn.wy_fast import prepare_wy_repr_bwd, recompute_w_u_fwd

__all__ = ["recompute_w_u_fwd", "prepare_wy_repr_bwd"]
