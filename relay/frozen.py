"""The base of every configuration model: validated once, immutable, unknown keys rejected,
and no input value in a validation error (a token, a password: pydantic quotes them)."""

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
