"""The OpenAI API as data: request schemas (strict, validated once), error bodies, the OpenAPI document."""
