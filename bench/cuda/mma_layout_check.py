# mma_layout_check.py: host-side emulation of matmul.cu's quantized GEMV for one m16 tile, 8
# activation columns and one 256-element unit, per type (Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS). It
# mirrors the kernel's per-lane weight decode (nibble masks, Q5_K fifth bit, Q6_K byte trick,
# IQ4_XS __byte_perm code book), the staging order (IQ4_XS permutation of prep_q8k_kernel<true>)
# and the PTX mma.m16n8k32/m16n8k16 .s8 fragment layouts, and checks the per-(row, column) float
# terms bitwise against a reference written from the CPU dot kernels' semantics (dtype/dot.c).
# Run: python3 bench/cuda/mma_layout_check.py   (numpy; no GPU). Expected: "bitwise" for each type.
import numpy as np, struct
rng = np.random.default_rng(1)
T = [-127,-104,-83,-65,-49,-35,-22,-10,1,13,25,38,53,69,89,113]
M32 = 0xffffffff
def u32(b, o): return struct.unpack_from('<I', bytes(b[o:o+4]))[0]
def u16(b, o): return b[o] | (b[o+1] << 8)
def byte_perm(x, y, s):
    src = [(x >> (8*i)) & 0xff for i in range(4)] + [(y >> (8*i)) & 0xff for i in range(4)]
    r = 0
    for n in range(4):
        r |= src[(s >> (4*n)) & 7] << (8*n)
    return r
def sbytes(w): return [((w >> (8*i)) & 0xff) - (256 if (w >> (8*i)) & 0x80 else 0) for i in range(4)]
def h2f(bits): return float(np.frombuffer(struct.pack('<H', bits & 0xffff), dtype=np.float16)[0])
def f32(x): return np.float32(x)

def iq4_lut(s):
    t0,t1,t2,t3 = 0xBFAD9881,0xF6EADDCF,0x26190D01,0x71594535
    sel = s & 0x7777
    lo = byte_perm(t0,t1,sel); hi = byte_perm(t2,t3,sel)
    return byte_perm(lo, hi, 0x3210 | ((s & 0x8888) >> 1))

def k4sm(sc12, j):
    q = sc12
    if j < 4: return q[j] & 63, q[j+4] & 63
    return (q[j+4] & 0xf) | ((q[j-4] >> 6) << 4), (q[j+4] >> 4) | ((q[j] >> 6) << 4)

def mma(A_regs, B_regs, k):  # A_regs[lane] = list of regs, B_regs[lane]; returns per-lane c[4]
    A = np.zeros((16, k), np.int64); B = np.zeros((k, 8), np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        ar = A_regs[lane]; br = B_regs[lane]
        if k == 32:
            for i, v in enumerate(sbytes(ar[0])): A[g][4*t+i] = v
            for i, v in enumerate(sbytes(ar[1])): A[g+8][4*t+i] = v
            for i, v in enumerate(sbytes(ar[2])): A[g][16+4*t+i] = v
            for i, v in enumerate(sbytes(ar[3])): A[g+8][16+4*t+i] = v
            for i, v in enumerate(sbytes(br[0])): B[4*t+i][g] = v
            for i, v in enumerate(sbytes(br[1])): B[16+4*t+i][g] = v
        else:
            for i, v in enumerate(sbytes(ar[0])): A[g][4*t+i] = v
            for i, v in enumerate(sbytes(ar[1])): A[g+8][4*t+i] = v
            for i, v in enumerate(sbytes(br[0])): B[4*t+i][g] = v
    C = A @ B
    out = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        out.append([C[g][2*t], C[g][2*t+1], C[g+8][2*t], C[g+8][2*t+1]])
    return out

UB = {'q8_0':272,'q4_k':144,'q5_k':176,'q6_k':210,'iq4_xs':136}

def rand_block(ty):
    b = bytearray(rng.integers(0, 256, UB[ty], dtype=np.uint8).tobytes())
    d = np.float16(0.001 + 0.004*rng.random()).view(np.uint16)
    m = np.float16(0.001 + 0.004*rng.random()).view(np.uint16)
    if ty == 'q8_0':
        for bk in range(8): struct.pack_into('<H', b, 34*bk, int(np.float16(0.001+0.004*rng.random()).view(np.uint16)))
    elif ty in ('q4_k','q5_k'): struct.pack_into('<HH', b, 0, int(d), int(m))
    elif ty == 'q6_k': struct.pack_into('<H', b, 208, int(d))
    else: struct.pack_into('<H', b, 0, int(d))
    return b

def deq_ints(ty, b):
    """integer quant values per element (CPU semantics) and per-element scale index info"""
    if ty == 'q4_k' or ty == 'q5_k':
        qs = b[16:] if ty == 'q4_k' else b[48:]
        q = []
        for e in range(256):
            sb, l = e // 32, e % 32; j = sb // 2
            v = (qs[32*j+l] >> (4*(sb&1))) & 0xf
            if ty == 'q5_k': v += 16 if (b[16+l] >> sb) & 1 else 0
            q.append(v)
        return q
    if ty == 'q6_k':
        q = [0]*256
        for n in range(2):
            ql = b[64*n:]; qh = b[128+32*n:]
            for l in range(32):
                q[128*n+l] = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32
                q[128*n+l+32] = ((ql[l+32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32
                q[128*n+l+64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32
                q[128*n+l+96] = ((ql[l+32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32
        return q
    if ty == 'iq4_xs':
        q = []
        for ib in range(8):
            qs = b[8+16*ib:]
            vals = [0]*32
            for j in range(16):
                vals[j] = T[qs[j] & 0xf]; vals[j+16] = T[qs[j] >> 4]
            q += vals
        return q
    if ty == 'q8_0':
        q = []
        for bk in range(8):
            q += [v - 256 if v > 127 else v for v in b[34*bk+2:34*bk+34]]
        return q

def ref_term(ty, b, xq, xd, xs32):
    """CPU-semantics per-unit float term for one row and one column"""
    q = deq_ints(ty, b)
    if ty == 'q8_0':
        acc = f32(0)
        for bk in range(8):
            s = sum(q[32*bk+i]*xq[32*bk+i] for i in range(32))
            acc = f32(acc + f32(f32(s) * f32(f32(h2f(u16(b,34*bk))) * f32(xd[bk]))))
        return acc
    if ty in ('q4_k','q5_k'):
        isum = 0; msum = 0
        for sb in range(8):
            sc, m = k4sm(b[4:16], sb)
            isum += sc * sum(q[32*sb+i]*xq[32*sb+i] for i in range(32))
            msum += m * xs32[sb]
        dd = f32(f32(h2f(u16(b,0))) * f32(xd[0])); dm = f32(f32(h2f(u16(b,2))) * f32(xd[0]))
        return f32(f32(dd*f32(isum)) - f32(dm*f32(msum)))
    if ty == 'q6_k':
        isum = 0
        for j in range(16):
            sc = b[192+j] - 256 if b[192+j] > 127 else b[192+j]
            isum += sc * sum(q[16*j+i]*xq[16*j+i] for i in range(16))
        dd = f32(f32(h2f(u16(b,208))) * f32(xd[0]))
        return f32(f32(dd*f32(isum)) - f32(0)*0)
    if ty == 'iq4_xs':
        isum = 0
        sh = u16(b, 2)
        for ib in range(8):
            ls = ((b[4+ib//2] >> (4*(ib%2))) & 0xf) | (((sh >> (2*ib)) & 3) << 4)
            isum += (ls-32) * sum(q[32*ib+i]*xq[32*ib+i] for i in range(32))
        dd = f32(f32(h2f(u16(b,0))) * f32(xd[0]))
        return f32(dd*f32(isum))

def perm_pos(ty, e):
    if ty != 'iq4_xs': return e
    s = e & 31
    return (e & ~31) + 8*((s & 15) >> 2) + 2*(s & 3) + (s >> 4)

def ld4(b, o): return u32(b, o)

def kernel_terms(ty, rows, xq_nat, xd, xs32):
    """emulate: rows = 16 blocks (one per tile row), 8 columns; returns res[row][col]"""
    # staged activations (prepass order), per column: 256 bytes
    stg = []
    for c in range(8):
        s = [0]*256
        for e in range(256): s[perm_pos(ty, e)] = xq_nat[c][e] & 0xff
        stg.append(bytes(s))
    res = np.zeros((16, 8), np.float32)
    acc = [[f32(0)]*4 for _ in range(32)]
    def B64(lane, off):  # uint2 from column g
        g = lane >> 2
        return [u32(stg[g], off), u32(stg[g], off+4)]
    if ty in ('q4_k','q5_k','iq4_xs'):
        isum = [[0]*4 for _ in range(32)]; msum = [[0]*4 for _ in range(32)]
        for sb in range(8):
            Ar = []; Br = []
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                regs = []
                for rr in (g, g+8):
                    b = rows[rr]
                    if ty == 'iq4_xs':
                        w = u32(b, 8 + 16*sb + 4*t)
                        regs.append((iq4_lut(w & 0xffff), iq4_lut(w >> 16)))
                    else:
                        j, h = sb >> 1, (sb & 1) * 4
                        base = 16 if ty == 'q4_k' else 48
                        qx, qy = u32(b, base + 32*j + 8*t), u32(b, base + 32*j + 8*t + 4)
                        lo, hi = (qx >> h) & 0x0F0F0F0F, (qy >> h) & 0x0F0F0F0F
                        if ty == 'q5_k':
                            hx, hy = u32(b, 16 + 8*t), u32(b, 20 + 8*t)
                            lo |= ((hx >> sb) & 0x01010101) << 4; hi |= ((hy >> sb) & 0x01010101) << 4
                        regs.append((lo, hi))
                Ar.append([regs[0][0], regs[1][0], regs[0][1], regs[1][1]])
                Br.append(B64(lane, sb*32 + 8*t))
            C = mma(Ar, Br, 32)
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                if ty == 'iq4_xs':
                    def ls(b):
                        sh = u16(b,2); return ((( (u32(b,4) >> (8*(sb>>1))) >> (4*(sb&1))) & 0xf) | (((sh >> (2*sb)) & 3) << 4)) - 32
                    sA, sB = ls(rows[g]), ls(rows[g+8]); mA = mB = 0
                else:
                    sA, mA = k4sm(rows[g][4:16], sb); sB, mB = k4sm(rows[g+8][4:16], sb)
                c = C[lane]
                isum[lane][0] += sA*c[0]; isum[lane][1] += sA*c[1]; isum[lane][2] += sB*c[2]; isum[lane][3] += sB*c[3]
                bs0, bs1 = xs32[2*t][sb], xs32[2*t+1][sb]
                msum[lane][0] += mA*bs0; msum[lane][1] += mA*bs1; msum[lane][2] += mB*bs0; msum[lane][3] += mB*bs1
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for e in range(4):
                row = g + 8*(e >> 1); col = 2*t + (e & 1)
                b = rows[row]
                if ty == 'iq4_xs': dw, dmw = h2f(u16(b,0)), 0.0
                else: dw, dmw = h2f(u16(b,0)), h2f(u16(b,2))
                dd = f32(f32(dw)*f32(xd[col][0])); dm = f32(f32(dmw)*f32(xd[col][0]))
                res[row][col] = f32(f32(dd*f32(isum[lane][e])) - f32(dm*f32(msum[lane][e])))
        return res
    if ty == 'q6_k':
        isum = [[0]*4 for _ in range(32)]
        for n in range(2):
            for q in range(4):
                for s in range(2):
                    Ar = []; Br = []
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        regs = []
                        for rr in (g, g+8):
                            b = rows[rr]
                            ql = ld4(b, 64*n + 32*(q&1) + 16*s + 4*t); qh = ld4(b, 128 + 32*n + 16*s + 4*t)
                            v = ((ql >> (4*(q>>1))) & 0x0F0F0F0F) | (((qh >> (2*q)) & 0x03030303) << 4)
                            x = v ^ 0x20202020
                            regs.append((x | (((x & 0x20202020) * 6) & M32)) & M32)
                        Ar.append([regs[0], regs[1]])
                        gcol = lane >> 2
                        Br.append([u32(stg[gcol], 128*n + 32*q + 16*s + 4*t)])
                    C = mma(Ar, Br, 16)
                    si = 8*n + 2*q + s
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        sA = rows[g][192+si]; sA = sA-256 if sA > 127 else sA
                        sB = rows[g+8][192+si]; sB = sB-256 if sB > 127 else sB
                        c = C[lane]
                        isum[lane][0] += sA*c[0]; isum[lane][1] += sA*c[1]; isum[lane][2] += sB*c[2]; isum[lane][3] += sB*c[3]
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for e in range(4):
                row = g + 8*(e >> 1); col = 2*t + (e & 1)
                dd = f32(f32(h2f(u16(rows[row],208)))*f32(xd[col][0]))
                res[row][col] = f32(f32(dd*f32(isum[lane][e])) - f32(0))
        return res
    if ty == 'q8_0':
        accs = np.zeros((16,8), np.float32)
        for bk in range(8):
            Ar = []; Br = []
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                regs = []
                for rr in (g, g+8):
                    b = rows[rr]; o = 34*bk + 2 + 8*t
                    regs.append((u16(b,o) | (u16(b,o+2) << 16), u16(b,o+4) | (u16(b,o+6) << 16)))
                Ar.append([regs[0][0], regs[1][0], regs[0][1], regs[1][1]])
                Br.append(B64(lane, bk*32 + 8*t))
            C = mma(Ar, Br, 32)
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                for e in range(4):
                    row = g + 8*(e >> 1); col = 2*t + (e & 1)
                    dw = f32(h2f(u16(rows[row], 34*bk)))
                    accs[row][col] = f32(accs[row][col] + f32(f32(C[lane][e]) * f32(dw * f32(xd[col][bk]))))
        return accs

for ty in ['q8_0','q4_k','q5_k','q6_k','iq4_xs']:
    rows = [rand_block(ty) for _ in range(16)]
    xq = [[int(v) for v in rng.integers(-127, 128, 256)] for _ in range(8)]
    xd = [[float(np.float32(0.01 + rng.random()*0.01)) for _ in range(8)] for _ in range(8)]
    xs32 = [[sum(xq[c][32*j:32*j+32]) for j in range(8)] for c in range(8)]
    got = kernel_terms(ty, rows, xq, xd, xs32)
    ref = np.array([[ref_term(ty, rows[r], xq[c], xd[c], xs32[c]) for c in range(8)] for r in range(16)], np.float32)
    print(ty, 'bitwise' if np.array_equal(got.view(np.uint32), ref.view(np.uint32)) else 'MISMATCH', float(np.abs(got-ref).max()), float(np.abs(ref).max()))
