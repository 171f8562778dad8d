"""The REST API's bodies, as pydantic v2 models (the edge): :mod:`.requests` what the routes accept,
:mod:`.responses` what they answer (with the one error shape of every 4xx and 5xx)."""
