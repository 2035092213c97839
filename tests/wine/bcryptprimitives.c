/* Wine 8 has no bcryptprimitives.dll, whose ProcessPrng Rust's std uses
 * for random numbers (HashMap keys). This stand-in, built with mingw and
 * copied into the Wine prefix's system32 by `make test-windows`, exports
 * ProcessPrng over RtlGenRandom (advapi32's SystemFunction036). */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!SystemFunction036(data, n))
            return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}
