"""overlapbench: measure and tune compute/communication overlap for tensor-parallel LLM inference.

Importing the package is cheap: torch, triton and CUDA are imported only where a step is built.
"""

__version__ = "0.1.0"
