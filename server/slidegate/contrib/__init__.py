"""Rate limiting inside Python web apps without Envoy: Django (``slidegate.contrib.django``) and ASGI
(``slidegate.contrib.asgi``) middleware sharing one set of options (``slidegate.contrib.common``)."""
