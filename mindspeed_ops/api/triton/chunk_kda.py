from ...ops.kda import ChunkKDAFunction, chunk_kda

__all__ = ["chunk_kda", "ChunkKDAFunction"]
