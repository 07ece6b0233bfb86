"""The project's asgi.py (what serve must serve when ASGI_APPLICATION is not set)."""


async def application(scope, receive, send):
    raise AssertionError("never called")
