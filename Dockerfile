# The gpushare image: the Python package (extender, device plugin, monitor, kubectl plugin)
# and the interception library, built without a CUDA toolkit (native/ declares what it uses).
FROM python:3.11-slim-bookworm AS native
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc make libc6-dev \
    libcjson-dev && rm -rf /var/lib/apt/lists/*
COPY native /src/native
RUN make -C /src/native build/libgpushare.so

FROM python:3.11-slim-bookworm
COPY pyproject.toml README.md /src/
COPY src /src/src
RUN pip install --no-cache-dir /src && rm -rf /src
COPY --from=native /src/native/build/libgpushare.so /opt/gpushare/lib/libgpushare.so
ENTRYPOINT ["gpushare"]
