"""MindSpeed-compatible module paths (SPEC 2.1). Functions dispatch by device like ``api.*``."""
