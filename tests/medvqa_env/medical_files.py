"""Small real medical files for tests: DICOMs written by pydicom, NIfTIs by nibabel, 16-bit and
float PNG/TIFF by Pillow. Each holds a phantom with a bright disc (a "lesion") at a known place."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

LESION = (40, 24, 8)  # cx, cy, r in pixels of a 64x48 image


def phantom(low: float, high: float, size=(64, 48), lesion=LESION) -> np.ndarray:
    """A ``size`` = (w, h) float image: a body at ``low`` with a disc at ``high``, a ramp beside it."""
    w, h = size
    yy, xx = np.mgrid[:h, :w]
    arr = np.full((h, w), low - (high - low), dtype=np.float64)  # air, below the body
    arr[4:h - 4, 4:w - 4] = low
    cx, cy, r = lesion
    arr[(xx - cx) ** 2 + (yy - cy) ** 2 <= r * r] = high
    return arr


def write_dicom(path: Path, stored: np.ndarray, *, slope: float = 1.0, intercept: float = 0.0,
                window: tuple[float, float] | None = None, photometric: str = "MONOCHROME2",
                modality: str = "CT") -> Path:
    """A single- or multi-frame (``stored.ndim == 3``) greyscale DICOM with the given tags."""
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = CTImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, meta.MediaStorageSOPInstanceUID
    ds.Modality, ds.PatientID = modality, "TEST"
    pixels = np.asarray(stored)
    signed = pixels.dtype.kind == "i"
    pixels = pixels.astype(np.int16 if signed else np.uint16)
    if pixels.ndim == 3:
        ds.NumberOfFrames = pixels.shape[0]
    ds.Rows, ds.Columns = pixels.shape[-2:]
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, int(signed)
    ds.RescaleSlope, ds.RescaleIntercept = slope, intercept
    if window is not None:
        ds.WindowCenter, ds.WindowWidth = window
    ds.PixelData = pixels.tobytes()
    ds.save_as(str(path), enforce_file_format=True)
    return path


def write_nifti(path: Path, volume: np.ndarray, affine: np.ndarray | None = None) -> Path:
    import nibabel as nib

    nib.save(nib.Nifti1Image(np.asarray(volume, dtype=np.float32), np.eye(4) if affine is None else affine), str(path))
    return path


def write_png16(path: Path, values: np.ndarray) -> Path:
    Image.fromarray(np.asarray(values, dtype=np.uint16)).save(path)
    return path


def write_float_tiff(path: Path, values: np.ndarray) -> Path:
    Image.fromarray(np.asarray(values, dtype=np.float32)).save(path)
    return path


def lesion_volume() -> np.ndarray:
    """A 64x48x9 RAS volume (x, y, z): the lesion phantom on slice z=6 only, -1000 elsewhere.
    Its axial slice 6, drawn radiologically, puts the lesion's centre at column 63 - 40, row 47 - 24."""
    vol = np.full((64, 48, 9), -1000.0, dtype=np.float32)
    vol[:, :, 6] = phantom(40.0, 200.0).T  # (y, x) image -> (x, y) voxels
    return vol


def write_jpeg_baseline_dicom(path: Path, grey: np.ndarray, quality: int = 90) -> Path:
    """A JPEG Baseline (Process 1) DICOM of an 8-bit greyscale image, its frame encoded by Pillow."""
    import io

    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.encaps import encapsulate
    from pydicom.uid import JPEGBaseline8Bit, SecondaryCaptureImageStorage, generate_uid

    buf = io.BytesIO()
    Image.fromarray(np.asarray(grey, dtype=np.uint8)).save(buf, format="JPEG", quality=quality)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = SecondaryCaptureImageStorage, meta.MediaStorageSOPInstanceUID
    ds.Modality, ds.PatientID = "OT", "TEST"
    ds.Rows, ds.Columns = np.asarray(grey).shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.PixelData = encapsulate([buf.getvalue()])
    ds["PixelData"].VR = "OB"
    ds.save_as(str(path), enforce_file_format=True)
    return path


def corrupt_jpeg_header(src: Path, dst: Path, fill: bytes = b"\x13", n: int = 60) -> Path:
    """``src`` with the ``n`` bytes after its JPEG frame's SOI marker overwritten (APP0/DQT garbled):
    GDCM 3.2 throws an uncaught C++ exception on this (SIGABRT) where Pillow raises cleanly."""
    data = bytearray(Path(src).read_bytes())
    soi = bytes(data).index(b"\xff\xd8\xff")
    data[soi + 2: soi + 2 + n] = fill * n
    Path(dst).write_bytes(bytes(data))
    return Path(dst)
