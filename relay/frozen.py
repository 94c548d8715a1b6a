"""The base of every configuration model: validated once, immutable, unknown keys rejected,
no infinite or NaN number (``.inf`` for a duration or a size is a typo, not "never"), and
no input value in a validation error (a token, a password: pydantic quotes them)."""

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True, allow_inf_nan=False)
