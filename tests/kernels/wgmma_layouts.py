"""A NumPy model of the shared-memory operands of wgmma, written from the PTX ISA's "Shared Memory
Matrix Layout" (its canonical layouts as CuTe shapes and strides, the Swizzle<B,4,3> XOR, the
matrix descriptor's fields) and of its accumulator fragment; and the inputs of one
wgmma_selftest.cu product with the product NumPy expects. Used by test_emulated_wgmma.py and by
ptx_selftest.py's wgmma suite (the hardware check of the same model)."""
import numpy

SWIZZLE_BYTES = {0: 16, 1: 128, 2: 64, 3: 32}  # the descriptor's mode: its row bytes W (16: no swizzle)
SWIZZLE_BITS = {0: 0, 1: 3, 2: 2, 3: 1}
SCRATCH_BYTES = 16384  # room for any one operand of these tests


def cute_offset(coordinate, shape, stride):
    """A CuTe layout's value at a 1-D coordinate of one mode: colexicographic over the sub-shape."""
    offset = 0
    for extent, step in zip(shape, stride):
        offset += (coordinate % extent) * step
        coordinate //= extent
    return offset


def canonical(mn_major, swizzle, leading, stride):
    """((mn shape), (mn stride)), ((k shape), (k stride)) in bf16 elements, from the ISA's table
    "Canonical Layouts" (T = 8 elements per 16 bytes; LBO, SBO given in bytes)."""
    t, lbo, sbo, repeat = 8, leading // 2, stride // 2, 1 << 20
    if mn_major:
        if swizzle == 0:
            return ((t, 1, repeat), (1, t, sbo)), ((8, repeat), (t, lbo))
        w = SWIZZLE_BYTES[swizzle] // 16
        return ((t, w, repeat), (1, t, lbo)), ((8, repeat), (w * t, sbo))
    if swizzle == 0:
        return ((8, repeat), (t, sbo)), ((t, repeat), (1, lbo))
    w = SWIZZLE_BYTES[swizzle] // 16
    return ((8, repeat), (w * t, sbo)), ((t, repeat), (1, t))


def swizzle_address(address, swizzle):
    """CuTe's Swizzle<B, 4, 3> on a byte address: bits [7, 7+B) XORed into bits [4, 4+B)."""
    bits = SWIZZLE_BITS[swizzle]
    return address ^ (((address >> 7) & ((1 << bits) - 1)) << 4)


def place(image, start, matrix, mn_major, swizzle, leading, stride, k_first=0):
    """Writes matrix[mn, k] (bf16 bits) into the image (bytes) where the wgmma reads element
    (mn, k) of an operand whose descriptor starts at `start`; k_first: the k-slice sits at columns
    k_first.. of a wider K-major tile, the descriptor's start moved by as many bytes."""
    (mn_shape, mn_stride), (k_shape, k_stride) = canonical(mn_major, swizzle, leading, stride)
    base, end = start - 2 * k_first, 0
    for mn in range(matrix.shape[0]):
        for k in range(16):
            element = cute_offset(mn, mn_shape, mn_stride) + cute_offset(k + k_first, k_shape, k_stride)
            at = swizzle_address(base + 2 * element, swizzle)
            image[at:at + 2] = numpy.frombuffer(matrix[mn, k].tobytes(), numpy.uint8)
            end = max(end, at + 2)
    return end


def layout_for(mn_major, swizzle, mn_size):
    """(leading, stride) byte offsets that pack an operand of mn_size × 16 densely."""
    if swizzle == 0:
        return (128 * (mn_size // 8), 128) if mn_major else (128, 256)
    w = SWIZZLE_BYTES[swizzle]
    if mn_major:
        return 8 * w, 8 * w * max(1, 2 * mn_size // w)  # LBO: the next W/2 columns of mn; SBO: the next 8 k
    return 16, 8 * w  # K-major: LBO unused (1 encoded), SBO: the next 8 rows


def fragment_rc(n):
    """(row, col) of register i of thread t of the 64×N accumulator, by the ISA's figure."""
    t, i = numpy.arange(128)[:, None], numpy.arange(n // 2)[None, :]
    return 16 * (t // 32) + (t % 32) // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (t % 4) + i % 2


def bf16(rng, shape):
    """(bits, values): random bf16 numbers as uint16 bits and as float64."""
    bits = (rng.standard_normal(shape).astype(numpy.float32).view(numpy.uint32) >> 16).astype(numpy.uint16)
    return bits, (bits.astype(numpy.uint32) << 16).view(numpy.float32).astype(numpy.float64)


def round_up(x, to):
    return (x + to - 1) // to * to


def product_case(rng, n, trans_a, trans_b, swizzle_a, swizzle_b, rs=False, accumulate=0, repeats=1):
    """(kernel name, arguments, dynamic shared bytes, expected 64×N tile) of one wgmma_product
    launch: A at offset 0 of the image, B at the next 1024-byte boundary, random bytes wherever no
    operand lies (a wrong address reads garbage), A's words as an argument only with rs; K-major 128B/64B operands are the second
    k-slice of a 32-wide tile (the descriptor's start 32 bytes in); c and d in fragment order."""
    a_bits, a = bf16(rng, (64, 16))
    b_bits, b = bf16(rng, (n, 16))  # B as (n, k)
    k_first_a = 16 if not trans_a and swizzle_a in (1, 2) else 0
    k_first_b = 16 if not trans_b and swizzle_b in (1, 2) else 0
    la, lb = layout_for(trans_a, swizzle_a, 64), layout_for(trans_b, swizzle_b, n)
    scratch = numpy.zeros(SCRATCH_BYTES, numpy.uint8)
    a_end = 0 if rs else place(scratch, 2 * k_first_a, a_bits, trans_a, swizzle_a, *la, k_first_a)
    b_at = round_up(a_end, 1024)
    b_end = place(scratch, 2 * k_first_b, b_bits, trans_b, swizzle_b, *lb, k_first_b)
    image = rng.integers(0, 256, b_at + round_up(b_end, 1024), dtype=numpy.uint8)
    if not rs:
        place(image, 2 * k_first_a, a_bits, trans_a, swizzle_a, *la, k_first_a)
    place(image, b_at + 2 * k_first_b, b_bits, trans_b, swizzle_b, *lb, k_first_b)
    layout = numpy.array([2 * k_first_a, *la, swizzle_a, b_at + 2 * k_first_b, *lb, swizzle_b], numpy.int32)
    c = (rng.standard_normal(128 * n // 2) if accumulate else numpy.zeros(128 * n // 2)).astype(numpy.float32)
    rows, cols = fragment_rc(n)
    initial = numpy.zeros((64, n))
    initial[rows, cols] = c.reshape(128, n // 2)
    name = f"wgmma_product<{n}, {str(trans_a).lower()}, {str(trans_b).lower()}, {str(rs).lower()}>"
    args = [image.view(numpy.uint32), numpy.int32(image.size // 4), layout,
            numpy.ascontiguousarray(a_bits).view(numpy.uint32).reshape(-1) if rs else numpy.zeros(1, numpy.uint32), c, numpy.int32(accumulate), numpy.int32(repeats),
            numpy.zeros_like(c)]
    return name, args, image.size, initial * accumulate + repeats * (a @ b.T)


def tile_from_fragments(d, n):
    """The 64×N tile from the accumulator registers in fragment order (thread t's at t·N/2)."""
    rows, cols = fragment_rc(n)
    tile = numpy.zeros((64, n))
    tile[rows, cols] = numpy.asarray(d).reshape(128, n // 2)
    return tile
