"""The base of every configuration model: validated once, immutable, unknown keys rejected,
no infinite or NaN number (``.inf`` for a duration or a size is a typo, not "never"), no
``true``/``false`` where a number is expected (pydantic would read them as 1 and 0), and
no input value in a validation error (a token, a password: pydantic quotes them)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _number_not_bool(annotation: Any) -> bool:
    """Whether a field of this type takes a number (int or float) but not a boolean."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(annotation)
        return bool not in args and any(_number_not_bool(a) for a in args)
    if origin is typing.Annotated:
        return _number_not_bool(typing.get_args(annotation)[0])
    return annotation is int or annotation is float


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, v: Any, info: ValidationInfo) -> Any:
        # YAML's true/false (yes/no, on/off) where a port, a count or a duration goes is a
        # slip, not 1 and 0. Numbers written as text (from ${VAR}) still go through.
        if isinstance(v, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _number_not_bool(field.annotation):
                raise ValueError("is true or false where a number is expected; fix: write a number")
        return v
