# The hub, the API and the operators: one image, the command chooses the role.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
# wingsmith/ holds links to the folders below; the wheel build follows them. Of deploy/, the
# package holds the operator's kustomize files (`wingsmith operator manifests` renders them).
COPY wingsmith wingsmith
COPY domain domain
COPY projections projections
COPY adapters adapters
COPY services services
COPY deploy/kubernetes/operator deploy/kubernetes/operator
RUN pip install --no-cache-dir . && useradd --system --create-home wingsmith \
    && install -d -o wingsmith /home/wingsmith/data
USER wingsmith
ENV WINGSMITH_DATA_DIR=/home/wingsmith/data
ENTRYPOINT ["wingsmith"]
CMD ["-v", "up"]
