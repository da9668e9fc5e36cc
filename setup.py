"""Install mmdinomamba (see tools/setup_env.sh for the full, pinned environment)."""
import os
import os.path as osp
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# What OpenMMLab packages ship in ``<package>/.mim``: mmengine reads ``pkg::`` config bases from
# ``.mim/configs`` and the model index from ``.mim/model-index.yml``; ``mim`` runs ``.mim/tools``.
# In the source tree these are committed symbolic links to the top-level folders (so a checkout
# or an editable install sees them at once); a wheel gets copies of the files.
MIM_ITEMS = ('configs', 'tools', 'model-index.yml')
MIM_SKIP = shutil.ignore_patterns('__pycache__', '*.pyc', '*.pyo')


def read_requirements(name):
    path = osp.join(osp.dirname(__file__), 'requirements', name)
    with open(path) as f:
        lines = [line.split('#')[0].strip() for line in f]
    return [line for line in lines if line]


def get_version():
    scope = {}
    with open(osp.join(osp.dirname(__file__), 'mmdinomamba', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


class BuildPyWithMim(build_py):
    """``build_py`` that also writes ``mmdinomamba/.mim/{configs,tools,model-index.yml}`` into
    the build folder as plain files (the links' targets), so wheels and non-editable installs
    carry the configs and tools."""

    def run(self):
        super().run()
        root = osp.dirname(osp.abspath(__file__))
        target = osp.join(self.build_lib, 'mmdinomamba', '.mim')
        for item in MIM_ITEMS:
            src, dst = osp.join(root, item), osp.join(target, item)
            if not osp.exists(src):
                raise FileNotFoundError(f'setup.py: {src} is missing; it ships in {target}')
            if osp.isdir(dst) and not osp.islink(dst):
                shutil.rmtree(dst)
            elif osp.lexists(dst):
                os.remove(dst)
            os.makedirs(target, exist_ok=True)
            if osp.isdir(src):
                shutil.copytree(src, dst, ignore=MIM_SKIP)
            else:
                shutil.copyfile(src, dst)


setup(
    name='mmdinomamba',
    version=get_version(),
    description='DINO-pretrained Vision Mamba, linear attention and ViT backbones, '
    'Binary-AUC and rank analysis as OpenMMLab plugins',
    long_description=open('README.md').read() if osp.exists('README.md') else '',
    long_description_content_type='text/markdown',
    packages=find_packages(exclude=('tests', 'tests.*', 'configs', 'tools')),
    # the native CPU kernels' source, compiled on the user's machine at first use
    package_data={'mmdinomamba.ops.cpu': ['csrc/*.cpp', 'csrc/*.h']},
    python_requires='>=3.9',
    install_requires=read_requirements('runtime.txt'),
    extras_require={
        'mm': read_requirements('mminstall.txt'),
        'tests': read_requirements('tests.txt'),
        'cuda': read_requirements('cuda.txt'),
        'tensorboard': read_requirements('optional.txt'),
    },
    license='Apache-2.0',
    zip_safe=False,
    cmdclass={'build_py': BuildPyWithMim},
)
