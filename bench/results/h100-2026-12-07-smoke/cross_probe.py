# One-off: does CUDA refuse an async copy whose host range crosses two cudaHostRegister registrations?
import mmap, ctypes, cupy as cp
rt = cp.cuda.runtime
N = 128 << 20
buf = mmap.mmap(-1, 2 * N)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
dst = cp.empty(N, dtype=cp.uint8)
s = cp.cuda.Stream()
def copy(off, n):
    try:
        rt.memcpyAsync(dst.data.ptr, addr + off, n, rt.memcpyHostToDevice, s.ptr); s.synchronize(); return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
rt.hostRegister(addr, N, 0); rt.hostRegister(addr + N, N, 0)
print("two registrations, copy inside the first:", copy(N // 2, N // 4))
print("two registrations, copy across the boundary:", copy(N - (1 << 20), 2 << 20))
rt.hostUnregister(addr + N)
print("one registered + one pageable, across:", copy(N - (1 << 20), 2 << 20))
rt.hostUnregister(addr)
rt.hostRegister(addr, 2 * N, 0)
print("one registration, across the old boundary:", copy(N - (1 << 20), 2 << 20))
rt.hostUnregister(addr)
