"""Running a sweep: the launch, the runtime (process groups, symmetric memory, NCCL windows), the point loop."""
