"""What every drafter's config shares: a plain JSON-able dict in checkpoints and exports, read back strictly. Torch
free."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any, TypeVar

C = TypeVar("C", bound="DrafterConfig")  # typing.Self needs Python 3.11; the package runs on 3.10


class DrafterConfig:
    """Mixed into a drafter's config dataclass (which defines ``validate() -> self`` and ``target_layer_ids``)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (``target_layer_ids`` as a list)."""
        out = asdict(self)  # type: ignore[call-overload]
        out["target_layer_ids"] = list(self.target_layer_ids)  # type: ignore[attr-defined]
        return out

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:  # noqa: PYI019 (typing.Self: Python >= 3.11)
        """Inverse of :meth:`to_dict`; unknown keys are a ValueError; the result is validated."""
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{cls.__name__}.from_dict: unknown keys {unknown}")
        return cls(**data).validate()  # type: ignore[attr-defined]
