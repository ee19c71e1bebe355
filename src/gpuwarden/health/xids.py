"""NVIDIA's Xid catalogue: what each XID means and NVIDIA's recommended actions.

Rows follow NVIDIA's Xid catalogue ("Resolution Bucket" immediate and
investigatory actions) for Ampere and newer GPUs; `gpuwarden.health.judgement` words the
actions (`health.ACTIONS`) and decides what is fatal. Kept apart from the
judgement because most readings have no XID at all: `status` and `run` judge
every GPU and load this table only when one is seen.
"""

from __future__ import annotations

from gpuwarden.base.records import record


@record
class XidInfo:
    """One row of NVIDIA's Xid catalogue."""

    xid: int
    mnemonic: str
    description: str
    immediate: str  # NVIDIA's resolution bucket, immediate action
    investigatory: str = "CONTACT_SUPPORT"


def _xid(xid: int, mnemonic: str, description: str, immediate: str, investig: str) -> XidInfo:
    return XidInfo(xid, mnemonic, description, immediate, investig)


_ROWS = (
    _xid(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "RESTART_APP",
         "CONTACT_SUPPORT"),
    _xid(13, "ROBUST_CHANNEL_GR_EXCEPTION", "graphics engine exception", "RESTART_APP",
         "WORKFLOW_XID_13"),
    _xid(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP",
         "WORKFLOW_XID_31"),
    _xid(32, "ROBUST_CHANNEL_PBDMA_ERROR", "invalid or corrupted push buffer stream",
         "RESTART_APP", "CHECK_APP/CUDA"),
    _xid(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "driver firmware error", "IGNORE",
         "CONTACT_SUPPORT"),
    _xid(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE",
         "CONTACT_SUPPORT"),
    _xid(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "preemptive cleanup, due to previous errors",
         "WORKFLOW_XID_45", "IGNORE"),
    _xid(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "RESET_GPU",
         "CONTACT_SUPPORT"),
    _xid(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "double-bit (uncorrectable) ECC error",
         "WORKFLOW_XID_48", "WORKFLOW_XID_48"),
    _xid(54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "auxiliary power not connected",
         "CHECK_MECHANICALS", "CONTACT_SUPPORT"),
    _xid(61, "PMU_BREAKPOINT", "internal micro-controller breakpoint/warning", "RESET_GPU",
         "CONTACT_SUPPORT"),
    _xid(62, "PMU_HALT_ERROR", "internal micro-controller halt", "RESET_GPU", "CONTACT_SUPPORT"),
    _xid(63, "INFOROM_DRAM_RETIREMENT_EVENT", "ECC page retirement or row remapping recorded",
         "IGNORE", "IGNORE"),
    _xid(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "ECC page retirement or row remapping failed",
         "RESET_GPU", "CONTACT_SUPPORT"),
    _xid(68, "ROBUST_CHANNEL_NVDEC0_ERROR", "video processor exception", "RESTART_APP",
         "CONTACT_SUPPORT"),
    _xid(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "graphics engine class error", "RESTART_APP",
         "CHECK_APP/CUDA"),
    _xid(74, "NVLINK_ERROR", "NVLink error", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT"),
    _xid(78, "VGPU_START_ERROR", "vGPU start failed", "UPDATE_SWFW", "UPDATE_SWFW"),
    _xid(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus",
         "RESTART_BM", "CONTACT_SUPPORT"),
    _xid(92, "EXCESSIVE_SBE_INTERRUPTS", "high single-bit ECC error rate", "IGNORE",
         "CONTACT_SUPPORT"),
    _xid(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "contained ECC error", "RESTART_APP",
         "IGNORE (sympathetic)"),
    _xid(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "uncontained ECC error", "RESET_GPU",
         "IGNORE (sympathetic)"),
    _xid(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "context switch timeout", "RESET_GPU",
         "CONTACT_SUPPORT"),
    _xid(110, "SEC_FAULT_ERROR", "security fault", "RESET_GPU", "INVESTIGATE_SW"),
    _xid(119, "GSP_RPC_TIMEOUT", "GSP firmware RPC timeout", "RESET_GPU", "INVESTIGATE_SW"),
    _xid(120, "GSP_ERROR", "GSP firmware error", "RESET_GPU", "INVESTIGATE_SW"),
    _xid(121, "C2C_ERROR", "chip-to-chip link error", "IGNORE", "CONTACT_SUPPORT"),
    _xid(136, "ALI_TRAINING_FAIL", "NVLink training failed", "RESET_GPU", "CONTACT_SUPPORT"),
    _xid(137, "NVLINK_PRIV_ERR", "NVLink privilege error", "IGNORE", "CONTACT_SUPPORT"),
    _xid(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "unrecovered ECC error", "RESET_GPU",
         "CONTACT_SUPPORT"),
    _xid(143, "GPU_INIT_ERROR", "GPU initialization failure", "RESET_GPU", "CONTACT_SUPPORT"),
    _xid(144, "NVLINK_SAW_ERROR", "NVLink SAW error", "WORKFLOW_NVLINK5_ERR", "CONTACT_SUPPORT"),
    _xid(145, "NVLINK_RLW_ERROR", "NVLink RLW error", "WORKFLOW_NVLINK5_ERR", "CONTACT_SUPPORT"),
    _xid(146, "NVLINK_TLW_ERROR", "NVLink TLW error", "WORKFLOW_NVLINK5_ERR", "CONTACT_SUPPORT"),
    _xid(149, "NVLINK_NETIR_ERROR", "NVLink NETIR error", "WORKFLOW_NVLINK5_ERR",
         "CONTACT_SUPPORT"),
    _xid(150, "NVLINK_MSE_ERROR", "NVLink MSE error", "WORKFLOW_NVLINK5_ERR", "CONTACT_SUPPORT"),
    _xid(154, "GPU_RECOVERY_ACTION_CHANGED", "GPU recovery action changed", "XID_154",
         "IGNORE"),
    _xid(155, "NVLINK_SW_DEFINED_ERROR", "NVLink software-defined error", "RESET_GPU",
         "INVESTIGATE_SW"),
    _xid(156, "RESOURCE_RETIREMENT_EVENT", "resource retirement event", "RESET_GPU", "IGNORE"),
    _xid(158, "GPU_FATAL_TIMEOUT", "GPU fatal timeout", "RESET_GPU", "CONTACT_SUPPORT"),
)  # fmt: skip

XID_CATALOGUE: dict[int, XidInfo] = {row.xid: row for row in _ROWS}
