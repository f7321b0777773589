/* tests/unit/small_models.h — small model specs that several reference-
 * backend tests train, written once so that they train the same model. */
#ifndef SF_TESTS_SMALL_MODELS_H
#define SF_TESTS_SMALL_MODELS_H

/* A residual block with batchnorm, maxpool and global average pooling:
 * 4 classes on 3x8x8 (ResNet's shape of layers in miniature). */
static const char *const RES_SPEC =
    "{\"input\":[3,8,8],\"classes\":4,\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"conv1\",\"out\":4,\"k\":3,\"pad\":1,\"bias\":false},"
    "{\"type\":\"batchnorm2d\",\"name\":\"bn1\"},{\"type\":\"relu\",\"name\":\"r1\"},"
    "{\"type\":\"conv2d\",\"name\":\"conv2\",\"out\":4,\"k\":3,\"pad\":1,\"bias\":false},"
    "{\"type\":\"batchnorm2d\",\"name\":\"bn2\"},"
    "{\"type\":\"add\",\"name\":\"add\",\"inputs\":[\"r1\",\"bn2\"]},{\"type\":\"relu\",\"name\":\"r2\"},"
    "{\"type\":\"maxpool2d\",\"name\":\"pool\",\"k\":2},"
    "{\"type\":\"global_avgpool\",\"name\":\"gap\"},{\"type\":\"flatten\",\"name\":\"flat\"},"
    "{\"type\":\"linear\",\"name\":\"fc\",\"out\":4}]}";

#endif /* SF_TESTS_SMALL_MODELS_H */
