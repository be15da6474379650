"""The OpenAI API as data: request schemas (strict, validated once), error bodies, the one strict JSON reader
and writer. The OpenAPI document of all the routes is the HTTP edge's (app/http/openapi.py)."""
