"""The real figures of the cards a spec can name, so a spec says `model = "A100-SXM4-80GB"`
and gets what NVML reports on that card, instead of every spec restating numbers.

Memory totals are what NVML's `nvmlDeviceGetMemoryInfo` reports (nvidia-smi's MiB
column), which is less than the marketing size where ECC or the driver keeps a slice.
Features a card lacks are listed in `unsupported`: the fake NVML answers those calls
with NVML_ERROR_NOT_SUPPORTED, as the real driver does.

The board's other figures: brand, PCIe link (generation, lanes), BAR1 aperture in
MiB, whether memory is HBM (with its own temperature sensor), the memory clocks
`nvmlDeviceGetSupportedMemoryClocks` lists (fastest first), default applications
clocks (graphics, memory; None where NVML says NotSupported), VBIOS version, and
InfoROM image and ECC-object versions (None: no ECC object). Version strings have
the shape of that card's; a given board's differ by firmware.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from typing import Any

MiB = 2**20

# nvmlBrandType_t values (nvidia-smi's "Product Brand").
BRAND_TESLA, BRAND_GEFORCE, BRAND_NVIDIA_RTX, BRAND_NVIDIA = 2, 5, 13, 14

# Feature names used in `unsupported` (and by the fake library's per-call checks).
ECC, MIG, REMAP, RETIRE, FAN, NVLINK, ENERGY, DISPLAY = (
    "ecc",
    "mig",
    "remapped_rows",
    "retired_pages",
    "fan",
    "nvlink",
    "energy",
    "display",
)

CARDS: dict[str, dict[str, object]] = {
    "RTX-3090": {
        "name": "NVIDIA GeForce RTX 3090",
        "memory_total": 24576 * MiB,
        "memory_reserved": 337 * MiB,
        "power_limit": 350.0,
        "compute_capability": (8, 6),
        "clock_sm_max": 2100,
        "clock_mem_max": 9751,
        "pci_device_id": 0x220410DE,
        "pci_subsystem_id": 0x38801028,
        "nvlinks": 0,
        "ecc_default": False,
        # GeForce: no ECC, MIG, row remapping or page retirement.
        "brand": BRAND_GEFORCE,
        "pcie": (4, 16),
        "bar1": 256,  # MiB; without Resizable BAR, as shipped
        "hbm": False,
        "memory_clocks": (9751, 9501, 5001, 810, 405),
        "app_clocks": None,  # GeForce: applications clocks are NotSupported
        "vbios": "94.02.42.00.A9",
        "inforom": ("G001.0000.03.03", None),
        "unsupported": (ECC, MIG, REMAP, RETIRE, NVLINK),
    },
    "A100-SXM4-80GB": {
        "name": "NVIDIA A100-SXM4-80GB",
        "memory_total": 81920 * MiB,
        "memory_reserved": 527 * MiB,
        "power_limit": 400.0,
        "compute_capability": (8, 0),
        "clock_sm_max": 1410,
        "clock_mem_max": 1593,
        "pci_device_id": 0x20B210DE,
        "pci_subsystem_id": 0x147F10DE,
        "nvlinks": 12,
        "max_mig": 7,
        "ecc_default": True,
        # Passively cooled SXM module; Ampere replaced page retirement with row remapping.
        "brand": BRAND_NVIDIA,
        "pcie": (4, 16),
        "bar1": 131072,
        "hbm": True,
        "memory_clocks": (1593,),
        "app_clocks": (1275, 1593),
        "vbios": "92.00.45.00.06",
        "inforom": ("G506.0212.00.02", "6.16"),
        "unsupported": (FAN, RETIRE, DISPLAY),
    },
    "A100-SXM4-40GB": {
        "name": "NVIDIA A100-SXM4-40GB",
        "memory_total": 40960 * MiB,
        "memory_reserved": 424 * MiB,
        "power_limit": 400.0,
        "compute_capability": (8, 0),
        "clock_sm_max": 1410,
        "clock_mem_max": 1215,
        "pci_device_id": 0x20B010DE,
        "pci_subsystem_id": 0x134F10DE,
        "nvlinks": 12,
        "max_mig": 7,
        "ecc_default": True,
        "brand": BRAND_NVIDIA,
        "pcie": (4, 16),
        "bar1": 65536,
        "hbm": True,
        "memory_clocks": (1215,),
        "app_clocks": (1095, 1215),
        "vbios": "92.00.19.00.13",
        "inforom": ("G506.0202.00.02", "6.16"),
        "unsupported": (FAN, RETIRE, DISPLAY),
    },
    "T4": {
        "name": "Tesla T4",
        "memory_total": 15360 * MiB,
        "memory_reserved": 255 * MiB,
        "power_limit": 70.0,
        "compute_capability": (7, 5),
        "clock_sm_max": 1590,
        "clock_mem_max": 5001,
        "pci_device_id": 0x1EB810DE,
        "pci_subsystem_id": 0x12A210DE,
        "nvlinks": 0,
        "ecc_default": True,
        "brand": BRAND_NVIDIA,
        "pcie": (3, 16),
        "bar1": 256,
        "hbm": False,
        "memory_clocks": (5001, 405),
        "app_clocks": (585, 5001),
        "vbios": "90.04.96.00.02",
        "inforom": ("G183.0200.00.02", "5.0"),
        "unsupported": (FAN, MIG, REMAP, NVLINK, DISPLAY),
    },
    "V100-SXM2-32GB": {
        "name": "Tesla V100-SXM2-32GB",
        "memory_total": 32768 * MiB,
        "memory_reserved": 258 * MiB,
        "power_limit": 300.0,
        "compute_capability": (7, 0),
        "clock_sm_max": 1530,
        "clock_mem_max": 877,
        "pci_device_id": 0x1DB510DE,
        "pci_subsystem_id": 0x124910DE,
        "nvlinks": 6,
        "ecc_default": True,
        "brand": BRAND_TESLA,
        "pcie": (3, 16),
        "bar1": 32768,
        "hbm": True,
        "memory_clocks": (877,),
        "app_clocks": (1312, 877),
        "vbios": "88.00.80.00.01",
        "inforom": ("G503.0203.00.05", "5.0"),
        "unsupported": (FAN, MIG, REMAP, DISPLAY),
    },
    "RTX-A6000": {
        "name": "NVIDIA RTX A6000",
        "memory_total": 49140 * MiB,
        "memory_reserved": 393 * MiB,
        "power_limit": 300.0,
        "compute_capability": (8, 6),
        "clock_sm_max": 2100,
        "clock_mem_max": 8001,
        "pci_device_id": 0x223010DE,
        "pci_subsystem_id": 0x145910DE,
        "nvlinks": 0,
        "ecc_default": False,  # supported, off by default on workstation cards
        "brand": BRAND_NVIDIA_RTX,
        "pcie": (4, 16),
        "bar1": 256,
        "hbm": False,
        "memory_clocks": (8001, 7601, 5001, 810, 405),
        "app_clocks": (1800, 8001),
        "vbios": "94.02.5C.00.02",
        "inforom": ("G133.0500.00.05", "6.16"),
        "unsupported": (MIG, RETIRE, NVLINK),
    },
    "H100-SXM5-80GB": {
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total": 81559 * MiB,
        "memory_reserved": 561 * MiB,
        "power_limit": 700.0,
        "compute_capability": (9, 0),
        "clock_sm_max": 1980,
        "clock_mem_max": 2619,
        "pci_device_id": 0x233010DE,
        "pci_subsystem_id": 0x16C110DE,
        "nvlinks": 18,
        "max_mig": 7,
        "ecc_default": True,
        "brand": BRAND_NVIDIA,
        "pcie": (5, 16),
        "bar1": 131072,
        "hbm": True,
        "memory_clocks": (2619,),
        "app_clocks": (1755, 2619),
        "vbios": "96.00.74.00.0D",
        "inforom": ("G520.0200.00.05", "7.0"),
        "unsupported": (FAN, RETIRE, DISPLAY),
    },
    "H200-SXM-141GB": {
        "name": "NVIDIA H200",
        "memory_total": 143771 * MiB,
        "memory_reserved": 581 * MiB,
        "power_limit": 700.0,
        "compute_capability": (9, 0),
        "clock_sm_max": 1980,
        "clock_mem_max": 3201,
        "pci_device_id": 0x233510DE,
        "pci_subsystem_id": 0x18BE10DE,
        "nvlinks": 18,
        "max_mig": 7,
        "ecc_default": True,
        "brand": BRAND_NVIDIA,
        "pcie": (5, 16),
        "bar1": 262144,
        "hbm": True,
        "memory_clocks": (3201,),
        "app_clocks": (1755, 3201),
        "vbios": "96.00.A5.00.01",
        "inforom": ("G525.0200.00.05", "7.0"),
        "unsupported": (FAN, RETIRE, DISPLAY),
    },
}

# MIG profiles: name -> (memory MiB NVML reports for the instance, slices)
MIG_PROFILES: dict[str, dict[str, tuple[int, int]]] = {
    "A100-SXM4-80GB": {
        "1g.10gb": (9728, 1),
        "2g.20gb": (19968, 2),
        "3g.40gb": (40192, 3),
        "4g.40gb": (40192, 4),
        "7g.80gb": (80896, 7),
    },
    "A100-SXM4-40GB": {
        "1g.5gb": (4864, 1),
        "2g.10gb": (9984, 2),
        "3g.20gb": (20096, 3),
        "4g.20gb": (20096, 4),
        "7g.40gb": (40192, 7),
    },
    "H100-SXM5-80GB": {
        "1g.10gb": (9984, 1),
        "2g.20gb": (20096, 2),
        "3g.40gb": (40448, 3),
        "7g.80gb": (80896, 7),
    },
    "H200-SXM-141GB": {
        "1g.18gb": (16384, 1),
        "2g.35gb": (32768, 2),
        "3g.71gb": (69632, 3),
        "7g.141gb": (139264, 7),
    },
}


def figures(gpu: dict[str, Any]) -> Any:
    """The figures of a simulated GPU's card (`CARDS` entry of the model its state names)."""
    return CARDS[gpu["model"]]
