"""The base of every configuration model: validated once, immutable, unknown keys rejected."""

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
