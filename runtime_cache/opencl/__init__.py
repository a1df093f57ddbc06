"""OpenCL consumer of runtime-cache: program binaries on pyopencl."""
