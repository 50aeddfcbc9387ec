"""kernels.wgmma_hazard on hand-written SASS: a write into a pending register-operand wgmma's
registers is found, across the loop's back edge too, and one after the wait that retires it is not."""
from vsr.kernels.wgmma_hazard import hazards, register_operand_wgmmas


def sass(text: str) -> list[tuple[int, str]]:
    return [(16 * i, line.strip()) for i, line in enumerate(text.strip().splitlines())]


LOOP = """
MOV R1, 0x1
LDS.128 R88, [R2]
WARPGROUP.ARRIVE
HGMMA.64x64x16.F32.BF16 R24, R88, gdesc[UR4], R24, gsb0
{between}
WARPGROUP.DEPBAR.LE gsb0, 0x{keep}
ISETP.NE.AND P0, PT, R1, RZ, PT
@P0 BRA 0x10
WARPGROUP.DEPBAR.LE gsb0, 0x0
EXIT
"""


def test_a_write_into_a_pending_operand_is_found():
    ins = sass(LOOP.format(between="LOP3.LUT R90, R3, 0xff, RZ, 0xc0, !PT", keep=1))
    assert register_operand_wgmmas(ins) == 1
    found = hazards(ins)
    assert any(h.startswith("0x0040 LOP3.LUT R90") and "operand R90" in h for h in found), found


def test_the_next_steps_load_into_a_pending_operand_is_found():
    # the wgmma stays in flight (LE 1) into the next step, whose LDS.128 rewrites R88-R91
    found = hazards(sass(LOOP.format(between="NOP", keep=1)))
    assert any("LDS.128 R88" in h and "operand R88" in h for h in found), found


def test_writes_after_the_wait_that_retires_it_are_not():
    assert hazards(sass(LOOP.format(between="NOP", keep=0))) == []


def test_an_accumulator_write_in_flight_is_found_and_shared_memory_operands_have_none():
    ins = sass(LOOP.format(between="FADD R30, R3, R4", keep=0)
               .replace("R24, R88, gdesc", "R24, gdesc[UR6], gdesc"))
    assert register_operand_wgmmas(ins) == 0
    found = hazards(ins)
    assert found and "accumulator R30" in found[0]
