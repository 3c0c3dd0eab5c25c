"""The OpenAI-compatible HTTP API.

- `handle`: `NodeHandle`, the API's only view of the node.
- `chat_request` / `instance_request` (with `validation`): request bodies -> typed requests.
- `chat_response`, `sse`, `errors`: typed results -> OpenAI's JSON, SSE events and errors.
- `completions`: one chat completion through the node, collected or streamed.
- `exchange`: a nursery per HTTP exchange, so a client that leaves cancels its generation.
- `app`: the Quart-trio app (`create_app`); `server`: `ApiServer`, the service serving it.
"""
