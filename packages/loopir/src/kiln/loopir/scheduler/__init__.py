"""The scheduler: nodes and dependencies, fusion, and the ordered program of kernels,
extern calls and no-ops the wrapper runs. See the package README."""
