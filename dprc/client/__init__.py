"""``dprc files …``, ``dprc jobs …``, ``dprc audit …``, ``dprc login`` and ``dprc accountant
… --server``: the command-line client of a dprc server, built on the official ``openai``
package (the client the Python examples use) with its raw requests for the endpoints OpenAI's
API does not have. It imports neither the library's engine nor torch, and the SDK only to
send a request, so a command starts in well under a second (docs/benchmarks/client_startup.md)."""
