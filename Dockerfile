# slidegate: the rate-limit service image (also runs the demo upstream in docker-compose.yml).
FROM python:3.11-slim

WORKDIR /src
COPY pyproject.toml README.md ./
COPY server ./server
COPY lua ./lua
COPY envoy ./envoy
COPY protos ./protos
RUN pip install --no-cache-dir . && rm -rf /src
# Envoy Gateway's command for its rate-limit container: /bin/ratelimit with no arguments is `slidegate serve`
COPY deploy/docker/ratelimit /usr/local/bin/ratelimit
RUN chmod 0755 /usr/local/bin/ratelimit && ln -s /usr/local/bin/ratelimit /bin/ratelimit

WORKDIR /
USER nobody
EXPOSE 8081 8080 6070
ENTRYPOINT ["slidegate"]
CMD ["serve", "--config", "/etc/slidegate/config"]
