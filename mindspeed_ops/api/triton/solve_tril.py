from ...ops.gdn import solve_tril

__all__ = ["solve_tril"]
