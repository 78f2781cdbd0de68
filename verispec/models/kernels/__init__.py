"""The products and their backends: Linear and the choice of kernel, quantization, the compiled
stack, and the native C library (native/) with its build, ctypes declarations and packing."""
